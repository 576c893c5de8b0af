"""Run ON an EC2 node (its source is sent over ssh as `python -c`): S3 in and out with the node's
own credentials (the instance role, read from IMDS by the AWS CLI or botocore; never keys copied
here). Standard library only at import; boto3 is imported only when the AWS CLI is absent.

    python -c SOURCE pull s3://bucket/prefix DEST    every object under prefix/ -> DEST/<rest of key>
    python -c SOURCE push SRC s3://bucket/prefix     every regular file under SRC -> prefix/<relative path>

The tool: the AWS CLI when `aws` is on PATH (and GPUCLUSTER_S3_TOOL is not "boto3") (the AWS Deep Learning AMIs ship it, with boto3:
"awscli ... and boto3 installed", DLAMI release notes,
https://docs.aws.amazon.com/dlami/latest/devguide/appendix-ami-release-notes.html), else boto3
in this Python. Both honor the standard endpoint variables AWS_ENDPOINT_URL_S3 and
AWS_ENDPOINT_URL ("Service-specific endpoints",
https://docs.aws.amazon.com/sdkref/latest/guide/feature-ss-endpoints.html), which is how tests
point a node at a local S3. The last stdout line is one JSON object: tool, files, bytes (and for
push: failed, a list of "path: why"). Exit 0: everything done; 3: some files failed (push);
4: nothing done (the reason on stderr).
"""

import json
import os
import shutil
import subprocess
import sys

PARTIAL_RC, FAILED_RC = 3, 4


def split(url):
    bucket, _, prefix = url[len("s3://"):].partition("/")
    return bucket, prefix.strip("/")


def cli_argv(mode, a, b):
    """The AWS CLI command for a pull (a=URL, b=DEST) or a push (a=SRC, b=URL)."""
    if mode == "pull":
        return ["aws", "s3", "sync", a.rstrip("/") + "/", b, "--only-show-errors", "--no-progress"]
    return ["aws", "s3", "cp", a, b.rstrip("/") + "/", "--recursive", "--only-show-errors", "--no-progress"]


def local_files(root):
    """[(relative path, size)] of the regular files under root (symlinks not followed)."""
    out = []
    for d, _dirs, names in os.walk(root):
        for name in sorted(names):
            p = os.path.join(d, name)
            if os.path.isfile(p) and not os.path.islink(p):
                out.append((os.path.relpath(p, root).replace(os.sep, "/"), os.path.getsize(p)))
    return sorted(out)


def fail(msg):
    sys.stderr.write(msg.strip()[-2000:] + "\n")
    sys.exit(FAILED_RC)


def safe_rel(rel):
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and not any(p in ("", ".", "..") for p in parts)


def pull_boto3(url, dest):
    import boto3

    bucket, prefix = split(url)
    s3 = boto3.client("s3")
    base = prefix + "/" if prefix else ""
    files = nbytes = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(base):]
            if rel.endswith("/") and obj["Size"] == 0:
                continue  # a "folder" marker
            if not safe_rel(rel):
                fail("refusing object key %r: it would land outside %s" % (obj["Key"], dest))
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = target + ".gpucluster-part"
            s3.download_file(bucket, obj["Key"], tmp)
            os.replace(tmp, target)
            files += 1
            nbytes += os.path.getsize(target)
    return files, nbytes


def push_boto3(src, url, todo):
    import boto3

    bucket, prefix = split(url)
    s3 = boto3.client("s3")
    base = prefix + "/" if prefix else ""
    failed = []
    for rel, _size in todo:
        try:
            s3.upload_file(os.path.join(src, rel), bucket, base + rel)
        except Exception as exc:  # noqa: BLE001 - reported per file
            failed.append("%s: %s" % (rel, str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__))
    # S3 answers a PutObject (and the last part of a multipart upload) only once the object is
    # stored: success per file is the check. A listing would need s3:ListBucket, which a write-only
    # role does not have.
    return failed


def choose_tool():
    """GPUCLUSTER_S3_TOOL (set by the launcher): "auto" (the CLI where there is one) or "boto3"."""
    auto = os.environ.get("GPUCLUSTER_S3_TOOL", "auto") == "auto"
    tool = "aws-cli" if auto and shutil.which("aws") else "boto3"
    if tool == "boto3":
        try:
            import boto3  # noqa: F401
        except ImportError:
            fail("neither the AWS CLI (aws on PATH) nor boto3 (in %s) is on this node: install one in "
                 "the image (staging runs before --setup)" % sys.executable)
    return tool


def pull(tool, url, dest):
    os.makedirs(dest, exist_ok=True)
    if tool == "aws-cli":
        cp = subprocess.run(cli_argv("pull", url, dest), capture_output=True, text=True)
        if cp.returncode != 0:
            fail("aws s3 sync %s failed (exit code %d): %s" % (url, cp.returncode, cp.stderr or cp.stdout))
        got = local_files(dest)
        files, nbytes = len(got), sum(s for _, s in got)
    else:
        try:
            files, nbytes = pull_boto3(url, dest)
        except Exception as exc:  # noqa: BLE001 - the reason goes back to the launcher
            fail("reading %s failed: %s: %s" % (url, type(exc).__name__, exc))
    if files == 0:
        fail("%s holds no objects: check the bucket and prefix" % url)
    print(json.dumps({"tool": tool, "files": files, "bytes": nbytes}))
    return 0


def push_cli(src, url):
    cp = subprocess.run(cli_argv("push", src, url), capture_output=True, text=True)
    if cp.returncode == 0:
        return []
    lines = [ln for ln in (cp.stderr or cp.stdout).splitlines() if ln.strip()]
    return ["aws s3 cp exited with code %d: %s" % (cp.returncode, "; ".join(lines[-3:]))]


def push(tool, src, url):
    todo = local_files(src) if os.path.isdir(src) else []
    failed = []
    if todo and tool == "aws-cli":
        failed = push_cli(src, url)
    elif todo:
        failed = push_boto3(src, url, todo)
    bad = {f.split(": ", 1)[0] for f in failed}
    ok = [(rel, s) for rel, s in todo if rel not in bad] if tool == "boto3" else ([] if failed else todo)
    print(json.dumps({"tool": tool, "files": len(ok), "bytes": sum(s for _, s in ok), "total_files": len(todo),
                      "failed": failed}))
    return 0 if not failed else (PARTIAL_RC if ok else FAILED_RC)


def main(argv):
    mode, a, b = argv[1], argv[2], argv[3]
    tool = choose_tool()
    if mode == "pull":
        return pull(tool, a, b)
    return push(tool, a, b)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
