"""What the Python client's tests share: their arguments and the check that the
ddp_client they import is the repository's current one."""
import filecmp
import glob
import os
import sys


def args():
    """BIN_DIR SOURCE_DIR from the command line (ctest passes them), the rest left to
    unittest."""
    if len(sys.argv) < 3:
        sys.exit("usage: %s BIN_DIR SOURCE_DIR [unittest args]" % sys.argv[0])
    bin_dir, source_dir = sys.argv[1], sys.argv[2]
    del sys.argv[1:3]
    return os.path.abspath(bin_dir), os.path.abspath(source_dir)


def import_client(source_dir):
    """The installed ddp_client, refused (with the command that fixes it) when it is not
    installed or its sources differ from the repository's python/ddp_client."""
    fix = ("run scripts/install_test_tools.sh (it installs the client from python/ into "
           "%s's venv)" % sys.executable)
    try:
        import ddp_client
    except ImportError as e:
        sys.exit("ddp_client is not importable by %s (%s): %s" % (sys.executable, e, fix))
    installed = os.path.dirname(ddp_client.__file__)
    for src in glob.glob(os.path.join(source_dir, "python", "ddp_client", "*.py")):
        copy = os.path.join(installed, os.path.basename(src))
        if not os.path.exists(copy) or not filecmp.cmp(src, copy, shallow=False):
            sys.exit("the installed ddp_client (%s) is older than python/ddp_client/%s: %s" %
                     (installed, os.path.basename(src), fix))
    return ddp_client
