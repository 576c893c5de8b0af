
import json, os, shutil, subprocess, sys
want_gpus = int(sys.argv[1])
info = {"python": sys.version.split()[0], "home": os.path.expanduser("~"),
        "setsid": bool(shutil.which("setsid")), "tar": bool(shutil.which("tar"))}
try:
    import torch
    info["torch"] = torch.__version__
except Exception as exc:
    info["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
if want_gpus:
    smi = shutil.which("nvidia-smi")
    if not smi:
        info["gpu_error"] = "nvidia-smi not found on PATH (is the NVIDIA driver installed?)"
    else:
        try:
            r = subprocess.run([smi, "--query-gpu=name,utilization.gpu,memory.used,memory.total",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                info["gpus"] = [l.strip() for l in r.stdout.splitlines() if l.strip()]
            else:
                info["gpu_error"] = "nvidia-smi failed: " + (r.stderr or r.stdout).strip()[-300:]
        except Exception as exc:
            info["gpu_error"] = "nvidia-smi failed: %s" % exc
print("@gpucluster-ready " + json.dumps(info))
sys.stdout.flush()
# leave without the interpreter's shutdown: with torch imported its final garbage collection
# takes about 0.5 s of CPU, and the launcher waits for this exit on every node
os._exit(0)
