"""The options the commands share, declared once (`OPTIONS`), and the numeric types that keep
gpucluster's one-line errors while Click's help shows INTEGER/FLOAT and the range.

A command takes its options by name: `@options("cloud", "nodes", ...)`; a name may carry its own
changes for one command (`options(..., nodes=dict(default=2))`). A new shared flag is one entry
here and its name in the commands that take it.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import click

from gpucluster.errors import UsageError, not_allowed
from gpucluster.infra.registry import NAMES as CLOUDS
from gpucluster.spec import parse_int

WORKLOAD_NAMES = ("digits", "mnist", "synthetic")  # gpucluster.lifecycle.prepare.WORKLOADS (not imported: --help stays light)


class Int(click.IntRange):
    """An integer in [low, high] (Click shows INTEGER RANGE and the bounds); a bad value is our one
    line naming it and what is allowed (`spec.parse_int`), exit 2."""

    def __init__(self, what: str, low: int, high: int | None = None, *, later: bool = False):
        super().__init__(min=low, max=high)
        self.what, self.later = what, later
        self.low, self.high = low, high  # click's min and max, typed as given

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # Any: an int, or with `later` the value as given (the core checks it against the other flag)
        try:
            return parse_int(self.what, value, low=self.low, high=self.high)
        except UsageError:
            if self.later:  # the bound depends on another flag (--nodes: the cloud's): the core says it
                return value
            raise


class Float(click.FloatRange):
    """A number above `low` (and at most `high`), as Click shows it; our one-line error otherwise."""

    def __init__(self, what: str, allowed: str, low: float = 0.0, high: float | None = None):
        super().__init__(min=low, max=high, min_open=True)
        self.what, self.allowed = what, allowed
        self.low, self.high = low, high  # click's min and max, typed as given

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value) if isinstance(value, (str, int, float)) else float("nan")
        except (TypeError, ValueError):
            number = float("nan")
        if not (number > self.low and (self.high is None or number <= self.high)):
            raise UsageError(not_allowed(self.what, value, self.allowed))
        return number


class Money(click.ParamType):
    """--max-cost: US dollars > 0 (gpucluster.costing.guards.parse_cost's one-line error otherwise)."""

    name = "usd"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        from gpucluster.costing.guards import parse_cost

        return value if isinstance(value, float) else parse_cost(value)


class Stall(click.ParamType):
    """--stall-minutes: minutes >= 0 (0: off)."""

    name = "minutes"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        from gpucluster.costing.guards import parse_stall

        return value if isinstance(value, float) else parse_stall(value)


_DATA_HELP = ("A local folder staged to every node (repeatable); the first is $GPUCLUSTER_DATA. DEST: relative "
              "to the job's working directory [default: data/BASENAME]. local: used in place, read-only. "
              "aws: also s3://BUCKET[/PREFIX][:DEST], gcp: gs://BUCKET[/PREFIX][:DEST], synced by every node "
              "with read-only access to just that prefix (DEST after the last ':').")
_PROJECT_HELP = "gcp: the project [default: stack config, GOOGLE_PROJECT... env, gcloud config, then the ADC project]."

def _use_state(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--state URL: checked for form, then the command's Pulumi state (GPUCLUSTER_STATE)."""
    if value:
        import os

        from gpucluster.infra.pulumi.state import STATE_ENV, parse_state

        os.environ[STATE_ENV] = parse_state(value)
    return value


# name -> (flags, Click keyword arguments)
OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {  # Any: Click's keyword arguments
    "cloud": (("--cloud",), dict(default="local", metavar="|".join(CLOUDS) + "|auto|A,B",
                                 help="Where the cluster runs [default: the task file's, GPUCLUSTER_CLOUD, the "
                                      "config file's cloud, else local]; auto or a list (aws,gcp): the cheapest "
                                      "candidate, failing over down the ranking (docs/placement.md).")),
    "nodes": (("--nodes", "-n"), dict(default=None, type=Int("nodes", 1, later=True),
                                      help="Number of nodes [default: 2; ssh: the number of --hosts]. local: at most "
                                           "16; clouds: at most 64.")),
    "gpus_per_node": (("--gpus-per-node",), dict(default=None, type=Int("gpus per node", 0, 16),
                                                 help="GPUs per node [default: all the node has; local: GPUs present "
                                                      "/ nodes].")),
    "procs_per_node": (("--procs-per-node",), dict(default=None, type=Int("procs per node", 1, 64),
                                                   help="Training processes per node [default: GPUs per node, or 1 on "
                                                        "CPU].")),
    "workload": (("--workload", "-w"), dict(default=None, metavar="|".join(WORKLOAD_NAMES),
                                            help="Built-in workload (default digits when no command is given after "
                                                 "--).")),
    "epochs": (("--epochs",), dict(default=None, type=Int("epochs", 1, 100000), help="Epochs for a built-in workload.")),
    "workload_args": (("--workload-args",), dict(default="", help="More arguments for the built-in workload, e.g. "
                                                                  "\"--batch-size 64\".")),
    "name": (("--name",), dict(default=None, metavar="NAME", help="Cluster name [default: gpucluster-CLOUD-OWNER, OWNER: the first 4 "
                                                  "hex digits of this home's installation id]; one another owner's "
                                                  "cluster holds in the account is refused.")),
    "region": (("--region",), dict(default=None, metavar="REGION|auto|A,B",
                                   help="Region [default: the cloud's]; auto or a list: ranked (docs/placement.md).")),
    "max_hourly": (("--max-hourly",), dict(default=None, metavar="DOLLARS",
                                           help="Placement: drop candidates whose cluster costs more per hour.")),
    "allow_egress": (("--allow-egress",), dict(is_flag=True, default=False,
                                               help="Placement: keep candidates outside the region or cloud of the "
                                                    "--data/--output bucket, egress priced in.")),
    "max_attempts": (("--max-attempts",), dict(default=None, type=Int("max attempts", 1, 100),
                                               help="Placement: try at most this many candidates [default: all].")),
    "zone": (("--zone",), dict(default=None)),
    "instance_type": (("--instance-type", "--machine-type", "instance_type"),
                      dict(default=None, help="EC2 type or GCE machine type (for experts: --gpu picks one).")),
    "gpu": (("--gpu",), dict(default=None, metavar="TYPE[:COUNT]",
                             help="aws/gcp: the GPU and how many per node, e.g. H100:8, L4, A100-80GB:4 [COUNT "
                                  "default: 1]; the cheapest machine in the region with exactly that many is used "
                                  "(`gpucluster gpus` lists them). kubernetes: COUNT GPUs per pod, on the nodes whose "
                                  "nvidia.com/gpu.product label names the GPU.")),
    "spot": (("--spot",), dict(is_flag=True, help="Spot/preemptible capacity.")),
    "disk_gb": (("--disk-gb",), dict(default=None, type=Int("disk size (GB)", 10, 16384),
                                     help="Root disk per node in GB [default: 100; aws: at least the image's root "
                                          "snapshot + 25].")),
    "max_minutes": (("--max-minutes",), dict(default=None, type=Float("max minutes", "a number of minutes > 0"),
                                             help="Wall-clock limit for the job; everything is stopped past it.")),
    "max_cost": (("--max-cost",), dict(default=None, type=Money(), metavar="USD",
                                       help="aws/gcp: stop the run when what it has cost (the report's figure, "
                                            "earlier attempts included) reaches USD: a warning at 80 %, then the job "
                                            "is stopped with time to save, outputs home, teardown; exit code 4. "
                                            "Refused when the estimate for --max-minutes exceeds it.")),
    "stall_minutes": (("--stall-minutes",), dict(default=None, type=Stall(), metavar="N",
                                                 help="Stop a job whose nodes print nothing, report no metric and "
                                                      "keep no GPU (CPU) busy for N minutes [default: 30 on aws/gcp, "
                                                      "off on local/ssh/kubernetes; 0: off].")),
    "max_lifetime": (("--max-lifetime",), dict(default=None, type=Int("max lifetime (minutes)", 5, 7 * 24 * 60),
                                               help="Minutes after which cloud nodes power themselves off, even if "
                                                    "this machine is gone [default: 240, raised to fit --max-minutes "
                                                    "and its margins; a value too short for them is refused].")),
    "ssh_cidr": (("--ssh-cidr",), dict(default=None, help="Who may SSH to cloud nodes (e.g. 203.0.113.7/32).")),
    "tags": (("--tag", "tags"), dict(multiple=True, metavar="KEY=VALUE", help="Extra tag/label (repeatable).")),
    "options": (("--option", "options"), dict(multiple=True, metavar="KEY=VALUE",
                                              help="Cloud option, as in the stack file (repeatable), e.g. --option "
                                                   "efa=true --option image=base.")),
    "dry_run": (("--dry-run",), dict(is_flag=True, help="aws/gcp: show what would be declared and run (the real "
                                     "Pulumi program under Pulumi's mocks) and the estimate; kubernetes: the manifests, "
                                     "without reaching the cluster; create nothing, need no credentials.")),
    "ready_timeout": (("--ready-timeout",), dict(default=None, type=Int("ready timeout (seconds)", 10, 6 * 3600),
                                                 help="Seconds to wait for cloud nodes to answer ssh and report "
                                                      "ready [default: what the image's boot steps and the node's own "
                                                      "bounds need, shown in the plan].")),
    "hosts": (("--hosts",), dict(default=None, help="ssh backend: user@host1,user@host2[:port], head first.")),
    "identity": (("--identity",), dict(default=None, type=click.Path(dir_okay=False), help="ssh private key.")),
    "known_hosts": (("--known-hosts",), dict(default=None, type=click.Path(dir_okay=False),
                                             help="ssh known_hosts file [default: ~/.ssh/known_hosts]; unknown host "
                                                  "keys are refused.")),
    "python": (("--python", "python"), dict(default=None, metavar="PYTHON",
                                          help="local: the Python (with torch and your script's packages) every node "
                                               "runs [default: the `python` on your PATH, i.e. your active "
                                               "environment; a built-in --workload: gpucluster's own Python]. "
                                               "ssh/aws: see --remote-python.")),
    "collect": (("--collect", "collect"), dict(multiple=True, metavar="PATTERN",
                                            help="Copy back only the files the job wrote in its working folder whose "
                                                 "path (or a folder of it) matches PATTERN (repeatable; fnmatch: "
                                                 "'*.pt', 'lightning_logs') [default: every file it created or "
                                                 "changed].")),
    "collect_limit": (("--collect-limit", "collect_limit"), dict(default=None, metavar="SIZE",
                                                             help="Most bytes copied back from each node's working "
                                                                  "folder, e.g. 500MB, 20GB [default: 10GB]; what is "
                                                                  "over is named and the outputs verdict is partial.")),
    "remote_python": (("--remote-python",), dict(default=None, help="ssh: the Python (with torch) to run on the "
                                                                    "nodes [default: python3].")),
    "threads_per_proc": (("--threads-per-proc",), dict(default=None, type=Int("threads per process", 1, 1024),
                                                       help="CPU threads per training process [default: cores / "
                                                            "processes].")),
    "max_restarts": (("--max-restarts",), dict(default=0, show_default=True, type=Int("max restarts", 0, 10),
                                               help="torchrun restarts (c10d restarts can hang: keep 0).")),
    "project": (("--project",), dict(default=None, help=_PROJECT_HELP)),
    "start_deadline": (("--start-deadline",), dict(default=20, show_default=True,
                                                   type=Int("start deadline (minutes)", 1, 24 * 60),
                                                   help="gcp, kubernetes: minutes every pod may take to be running (GPU "
                                                        "nodes, driver, image, Kueue admission); past it the run fails "
                                                        "with the scheduler's reason.")),
    # --cloud kubernetes: which cluster (a kubeconfig context) and where in it; stored as the run's options
    "context": (("--context",), dict(default=None, metavar="NAME",
                                     help="kubernetes: the kubeconfig context [default: its current context; "
                                          "$KUBECONFIG or ~/.kube/config, as kubectl reads them].")),
    "namespace": (("--namespace",), dict(default=None, metavar="NS",
                                         help="kubernetes: the namespace [default: the context's, else default].")),
    "create_namespace": (("--create-namespace",), dict(is_flag=True, default=None,
                                                       help="kubernetes: make the namespace when it is missing "
                                                            "(removed after the run); refused otherwise.")),
    "data": (("--data", "data"), dict(multiple=True, metavar="SRC[:DEST]", help=_DATA_HELP)),
    "setup": (("--setup", "setup"), dict(multiple=True, metavar="CMD",
                                         help="Shell command run on every node before training, in the job's folder "
                                              "and environment (repeatable, run in order), e.g. --setup 'pip install "
                                              "-r requirements.txt'.")),
    "output": (("--output", "output"), dict(default=None, metavar="DIR|URL",
                                            help="Where every node's output folder (GPUCLUSTER_OUTPUT_DIR) is copied "
                                                 "back before teardown, as DIR/node-N: a new or empty folder [default: "
                                                 "$GPUCLUSTER_HOME/runs/RUN_ID/outputs]. aws: also s3://BUCKET[/PREFIX], "
                                                 "gcp: gs://BUCKET[/PREFIX]: every node uploads its folder to "
                                                 "PREFIX/RUN_ID/node-N with write access to just that prefix, nothing "
                                                 "is copied back.")),
    "state": (("--state",), dict(default=None, metavar="URL", expose_value=False, callback=_use_state,
                                 help="aws/gcp: where the clusters' Pulumi state lives, shared by a team: s3://BUCKET"
                                      "[/PREFIX], gs://BUCKET[/PREFIX], azblob://CONTAINER or file:///PATH [default: "
                                      "$GPUCLUSTER_STATE, \"state\" in $GPUCLUSTER_HOME/config.json, else this "
                                      "home's own]. Needs PULUMI_CONFIG_PASSPHRASE (the team's) or a KMS key.")),
    "keep": (("--keep",), dict(is_flag=True, help="Leave the cluster up after the run.")),
    "yes": (("--yes", "-y"), dict(is_flag=True, help="Do not ask before creating billable resources.")),
    "quiet": (("--quiet", "-q"), dict(is_flag=True, help="No node logs, only progress and the report.")),
    "as_json": (("--json", "as_json"), dict(is_flag=True, help="Print the result as JSON.")),
    "task_file": (("-f", "--file", "task_file"), dict(default=None, metavar="TASK.yaml", expose_value=False,
                                                      help="A task file (docs/tasks.md): its settings are the "
                                                           "defaults, flags given here win. Also as the first "
                                                           "argument: `gpucluster run task.yaml`.")),
    "env": (("--env", "env"), dict(multiple=True, metavar="KEY=VALUE",
                                   help="An environment variable for every rank and --setup command (repeatable).")),
    "env_file": (("--env-file", "env_file"), dict(multiple=True, metavar="FILE",
                                                  help="KEY=VALUE lines for every rank (repeatable; --env wins).")),
    "secret": (("--secret", "secret"), dict(multiple=True, metavar="NAME",
                                            help="Pass this machine's environment variable NAME to every rank "
                                                 "(repeatable); its value is never shown, stored or put on a "
                                                 "command line.")),
    "resume": (("--resume", "resume"), dict(default=None, metavar="RUN_ID",
                                            help="Continue an earlier run: its collected outputs are staged to every "
                                                 "node as $GPUCLUSTER_RESUME_DIR (like --data, DEST resume/); the "
                                                 "built-in workloads go on after the epoch its checkpoint holds. The "
                                                 "ledger links the two runs.")),
    # issue 30: the health check and automatic recovery (docs/recovery.md)
    "check": (("--check/--no-check", "check"), dict(default=None,
                                                  help="Check every node before training: its GPUs (nvidia-smi, a "
                                                       "matmul, DCGM), disk, clock, and every node pair's link "
                                                       "[default: on for aws and gcp, off for local/ssh].")),
    "recover": (("--recover",), dict(default=None, type=Int("recover", 0, 20), metavar="N",
                                     help="When a node is lost (spot interruption, preemption, unreachable, agent "
                                          "killed), provision again and resume from the last checkpoint, up to N "
                                          "times [default: 3 with --spot, else 0].")),
    "fallback": (("--fallback",), dict(default=None, metavar="on-demand",
                                       help="With --spot and --recover: after --fallback-after spot attempts lost to "
                                            "an interruption or no capacity, run the rest on on-demand capacity.")),
    "fallback_after": (("--fallback-after",), dict(default=None, type=Int("fallback after", 1, 20), metavar="K",
                                                   help="Spot attempts lost before --fallback applies [default: 2].")),
    "checkpoint_every": (("--checkpoint-every",), dict(default=None, type=Int("checkpoint every", 1, 10 ** 9),
                                                       metavar="STEPS",
                                                       help="Built-in workloads: also checkpoint every STEPS steps, "
                                                            "not only after each epoch (a lost node then costs at "
                                                            "most STEPS steps).")),
}

# the cluster's shape and place: `up`, `run` (and, in part, `sweep` and `cost estimate`)
CLUSTER = ("cloud", "nodes", "gpu", "gpus_per_node", "name", "region", "zone", "instance_type", "spot", "disk_gb",
           "max_lifetime", "ssh_cidr", "tags", "options", "dry_run", "yes", "as_json", "project", "state")
# the job: `run` and `sweep`
JOB = ("workload", "epochs", "workload_args", "threads_per_proc", "data", "setup")
# what a job's own environment is made of: `run` and `sweep`
ENV = ("env", "env_file", "secret")

# `--help` of the commands that take a task file lists their options under these headings
# (`cli.taskopts.TaskCommand.format_options`); an option not named here is under "Options".
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Task file", ("task_file",)),
    ("Cluster", ("cloud", "nodes", "gpu", "gpus_per_node", "name", "region", "zone", "max_hourly", "max_attempts", "allow_egress", "instance_type", "spot", "disk_gb",
                 "project", "context", "namespace", "create_namespace", "ssh_cidr", "hosts", "tags", "options")),
    ("Job", ("workload", "epochs", "workload_args", "procs_per_node", "threads_per_proc", "setup", "data", "resume",
             "python")),
    ("Environment", ENV),
    ("Reaching the nodes", ("identity", "known_hosts", "remote_python")),
    ("Limits", ("max_minutes", "max_cost", "stall_minutes", "max_lifetime", "max_restarts", "ready_timeout",
                "start_deadline")),
    ("Outputs", ("output", "collect", "collect_limit", "keep")),
    ("Behaviour", ("dry_run", "yes", "quiet", "as_json", "help")),
)


F = TypeVar("F", bound=Callable[..., object])


def options(*names: str, **changes: dict[str, Any]) -> Callable[[F], F]:  # Any: Click's keyword arguments
    """Click decorators for the named options, in the order given (as `--help` lists them)."""

    def apply(fn: F) -> F:
        for name in reversed(names):
            flags, kw = OPTIONS[name]
            fn = click.option(*flags, **{**kw, **changes.get(name, {})})(fn)
        return fn

    return apply
