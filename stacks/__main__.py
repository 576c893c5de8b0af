"""`pulumi up -s <stack>` from the repository root runs this (Pulumi.yaml: main: stacks/)."""
from gpucluster.infra.program import main

main()
