# The gRPC stubs of proto/ddp/v1, generated into ddp/v1 below when the package is built
# (setup.py); not committed.
