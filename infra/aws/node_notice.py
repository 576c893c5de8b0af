"""Runs on every EC2 node beside the job (standard library only): watches the instance metadata for
a spot interruption notice and says so on the node's output, where gpucluster's supervisor turns it
into a lost node (gpucluster/watch/nodeloss.py) two minutes before the instance goes.

    python node_notice.py [--interval 5] [--url http://169.254.169.254] [--keyed]

IMDSv2 (the instances require it, component.py): a session token from `PUT /latest/api/token`
(header X-aws-ec2-metadata-token-ttl-seconds), sent as X-aws-ec2-metadata-token with every read;
`GET /latest/meta-data/spot/instance-action` answers 404 until EC2 schedules the instance's stop or
termination, then `{"action": "terminate", "time": "2017-09-18T08:22:00Z"}` (EC2 user guide, "Spot
Instance interruption notices": checked every 5 s, as AWS recommends). A token that expires (401)
is renewed. GPUCLUSTER_IMDS_URL overrides the address (the tests' fake nodes serve it on loopback).

On a notice it prints one metric record, `{"kind": "node_notice", "source": "aws spot", "action",
"when"}` (`when`: the notice's time, as text; a record's `time` is a Unix time), and exits 0.
With `--keyed` it first reads one line from its stdin, its key (gpucluster/watch/control.py), which the
record carries: a job that prints the same line cannot end the run as if the cloud took the node
back. if the metadata service never answers it says so once and exits 0 (the
job is not its business). It is stopped with the node's job (it carries the run's environment).
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

METRIC = "@gpucluster-metric "
TTL = "21600"


def request(url, method="GET", headers=None, timeout=2.0):
    req = urllib.request.Request(url, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read().decode("utf-8", "replace")


def token(base):
    return request(base + "/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": TTL})[1].strip()


def parse_args(argv):
    """(poll interval, the metadata service's base URL, the run's key or None) from the arguments."""
    interval, base = 5.0, os.environ.get("GPUCLUSTER_IMDS_URL") or "http://169.254.169.254"
    args, key = list(argv), None
    while args:
        flag = args.pop(0)
        if flag == "--keyed":
            key = sys.stdin.readline().strip()
        elif flag == "--interval" and args:
            interval = float(args.pop(0))
        elif flag == "--url" and args and not os.environ.get("GPUCLUSTER_IMDS_URL"):
            base = args.pop(0)
    return interval, base.rstrip("/"), key


def token_after(exc, tok):
    """The token to use after an HTTP error: none after 401 (it expired, or was never good)."""
    if exc.code == 401:
        return None
    if exc.code != 404:
        print(f"node_notice: the instance metadata answered {exc.code}", file=sys.stderr, flush=True)
    return tok


def notice_record(status, body, key):
    """The metric record of an interruption notice, or None when there is none."""
    try:
        notice = json.loads(body)
    except ValueError:
        notice = {}
    if not (status == 200 and isinstance(notice, dict) and notice.get("action")):
        return None
    record = {"kind": "node_notice", "source": "aws spot", "action": notice.get("action"), "when": notice.get("time")}
    if key:
        record["key"] = key
    return record


def main(argv):
    interval, base, key = parse_args(argv)
    tok, misses = None, 0
    while True:
        try:
            if tok is None:
                tok = token(base)
            status, body = request(base + "/latest/meta-data/spot/instance-action",
                                   headers={"X-aws-ec2-metadata-token": tok})
            misses = 0
        except urllib.error.HTTPError as exc:
            misses = 0
            tok = token_after(exc, tok)
            time.sleep(interval)
            continue
        except (urllib.error.URLError, OSError, ValueError) as exc:
            misses += 1
            if misses == 3:
                print(f"node_notice: the instance metadata at {base} does not answer ({exc}); not watching "
                      "for interruption notices", file=sys.stderr, flush=True)
                return 0
            time.sleep(interval)
            continue
        record = notice_record(status, body, key)
        if record is not None:
            print(METRIC + json.dumps(record), flush=True)
            return 0
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
