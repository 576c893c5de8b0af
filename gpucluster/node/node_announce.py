-1  # does nothing: torchrun's failure summary names the first argument not starting with '-' (the user's program)
import json,os,sys
e=os.environ
print('@gpucluster-metric '+json.dumps({'kind':'worker_start','rank':int(e.get('RANK','0')),'local_rank':int(e.get('LOCAL_RANK','0')),'pid':os.getpid()}),flush=True)
e.pop('GPUCLUSTER_PG_SAID',None)
h=e.get('GPUCLUSTER_PG_HOOK')
if h and os.path.isfile(os.path.join(h,'sitecustomize.py')):p=e.get('PYTHONPATH');e['PYTHONPATH']=h+(os.pathsep+p if p else '')
a=json.loads(sys.argv[2])
c=a[1:] if a[0]=='--no-python' else [sys.executable,'-u',*a]
try:
 os.execvp(c[0],c)
except OSError as x:
 sys.stderr.write('gpucluster: cannot start %r: %s\n'%(c[0],x));sys.exit(127)
