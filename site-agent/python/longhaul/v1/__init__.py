"""Generated gRPC stubs of trainer.proto (see generate.sh)."""
