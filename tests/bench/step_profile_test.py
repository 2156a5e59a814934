"""bench/gpu/step_profile.py: the kinds a kernel's name falls in, the busy time as the union
of the device's intervals, and the per-step table, on kernel names as torch.profiler
reports them on an H100/H200 (stdlib unittest; the profiler itself runs in the GPU bench
and, on the CPU, in its dry run)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "bench", "gpu"))
import step_profile as sp  # noqa: E402


class StepProfileTest(unittest.TestCase):
    def test_kinds(self):
        cases = {
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "NCCL",
            "triton_red_fused__log_softmax_0": "Triton (fused by torch.compile)",
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>": "attention",
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "matmul",
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>":
                "LayerNorm",
            "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>": "GELU",
            "void at::native::(anonymous namespace)::fused_adam_kernel": "optimizer",
            "Memcpy HtoD (Pinned -> Device)": "memcpy and memset",
            "void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>": sp.OTHER,
        }
        for name, kind in cases.items():
            self.assertEqual(sp.kind_of(name), kind, name)

    def test_busy_is_the_union_of_intervals(self):
        self.assertEqual(sp.union_us([(0, 10), (5, 15), (20, 30)]), 25)
        self.assertEqual(sp.union_us([(0, 10), (2, 3)]), 10)
        self.assertEqual(sp.union_us([]), 0)

    def test_table_per_step(self):
        ms = 1000.0  # The profiler's times are in microseconds.
        events = [("gemm_a", 0, 10 * ms), ("gemm_a", 10 * ms, 20 * ms),
                  ("ncclKernel", 15 * ms, 25 * ms), ("add", 30 * ms, 31 * ms)]
        r = sp.summarize_events(events, 0.040, 2)  # Two steps in 40 ms.
        self.assertEqual(r["steps"], 2)
        self.assertEqual(r["wall_ms_per_step"], 20.0)
        self.assertEqual(r["kernel_ms_per_step"], 15.5)
        self.assertEqual(r["busy_pct"], 65.0)  # 26 of 40 ms: the NCCL kernel overlaps a gemm
        self.assertEqual(r["kinds_ms_per_step"], {"matmul": 10.0, "NCCL": 5.0, sp.OTHER: 0.5})
        self.assertEqual(r["top_kernels"][0], ["gemm_a", 10.0, 1.0])

if __name__ == "__main__":
    unittest.main()
