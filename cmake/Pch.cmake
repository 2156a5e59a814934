# One precompiled LibTorch for the programs that include it (decision 183,
# docs/decisions/build.md).
#
# Most of a LibTorch program's compile is <torch/torch.h> itself (about 20 s of a test
# program's 22 with gcc): the libddp test programs, the trainer's tests, the benches and
# the examples each parse it again. With clang, every executable that links LibTorch
# (directly or through libddp, the engine or the trainer's library) takes it from one
# precompiled header instead (clang's PCH with its templates instantiated once: about
# 4.5 s for such a program against 15.7 without, 22.6 with gcc). The libraries' own
# units (the engine, libddp, the trainer's library) include narrower headers and keep
# no PCH: a fresh build dir elsewhere (the install test's) hits their ccache entries,
# which a PCH, whose file holds its own path, would not.
#
# Clang only: gcc's PCH of the same header is a 586 MB file per build and saves less
# than half; DDP_PCH is off there by default. The programs' flags must agree with the
# host's where clang checks them (PIE, optimization level, threads, language options):
# a program that sets POSITION_INDEPENDENT_CODE is left out, and all of them, the host
# too, compile with -pthread (GoogleTest's imported target adds it to some).
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  set(_ddp_pch_default ON)
else()
  set(_ddp_pch_default OFF)
endif()
option(DDP_PCH "Precompile <torch/torch.h> once for every program that links LibTorch (clang)"
       ${_ddp_pch_default})

# The build system targets of `dir` and below, in order.
function(_ddp_targets_below dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _ddp_targets_below(${sub} below)
    list(APPEND targets ${below})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# ddp_torch_pch(): call once, after every target is defined.
function(ddp_torch_pch)
  if(NOT DDP_PCH)
    return()
  endif()
  _ddp_targets_below(${PROJECT_SOURCE_DIR} targets)
  # Which targets see LibTorch: those that link it or link a target that does (to a
  # fixed point, since a target may be defined before what it links).
  set(torch_users torch torch_library ${TORCH_LIBRARIES})
  set(changed TRUE)
  while(changed)
    set(changed FALSE)
    foreach(t IN LISTS targets)
      if(t IN_LIST torch_users)
        continue()
      endif()
      get_target_property(links ${t} LINK_LIBRARIES)
      if(NOT links)
        continue()
      endif()
      foreach(l IN LISTS links)
        if(TARGET ${l})
          get_target_property(aliased ${l} ALIASED_TARGET)
          if(aliased)
            set(l ${aliased})
          endif()
        endif()
        if(l IN_LIST torch_users)
          list(APPEND torch_users ${t})
          set(changed TRUE)
          break()
        endif()
      endforeach()
    endforeach()
  endwhile()

  set(programs "")
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    get_target_property(pic ${t} POSITION_INDEPENDENT_CODE)
    if(type STREQUAL "EXECUTABLE" AND t IN_LIST torch_users AND NOT pic)
      list(APPEND programs ${t})
    endif()
  endforeach()
  if(NOT programs)
    return()
  endif()
  # The host: flags as a program that links libddp has them.
  file(WRITE ${CMAKE_BINARY_DIR}/ddp_torch_pch.cc "// The host of the programs' precompiled LibTorch (cmake/Pch.cmake).\n")
  add_library(ddp_torch_pch OBJECT ${CMAKE_BINARY_DIR}/ddp_torch_pch.cc)
  target_link_libraries(ddp_torch_pch PRIVATE ddp)
  target_precompile_headers(ddp_torch_pch PRIVATE <torch/torch.h>)
  target_compile_options(ddp_torch_pch PRIVATE -pthread)
  foreach(t IN LISTS programs)
    target_precompile_headers(${t} REUSE_FROM ddp_torch_pch)
    target_compile_options(${t} PRIVATE -pthread)
  endforeach()
  list(LENGTH programs n)
  message(STATUS "ddp: ${n} programs share one precompiled <torch/torch.h> (DDP_PCH)")
endfunction()
