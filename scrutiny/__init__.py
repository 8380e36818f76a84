"""scrutiny: a cluster metadata scrutiny daemon for Apache BookKeeper and Pulsar."""

import os

# gRPC's C core logs through absl, which prints every INFO line (a peer's GOAWAY on each clean stop) until
# something sets a level: quiet unless the operator asks (GRPC_VERBOSITY=INFO or DEBUG, GRPC_TRACE). Set here,
# before any module of ours imports grpc.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
