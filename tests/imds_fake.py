"""A fake EC2 instance metadata service (IMDSv2 required, as the cluster's instances are made:
infra/aws/component.py), served on loopback for one fake node. It behaves as EC2's does, at its
least helpful (EC2 user guide, "Use the Instance Metadata Service to access instance metadata" and
"Spot Instance interruption notices"):

- a session token only from `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`
  between 1 and 21600: without it, or out of range, 400 (Missing or Invalid Parameters); a PUT
  that carries `X-Forwarded-For` is refused, 403;
- every read needs a token it issued and that has not expired: else 401 (Unauthorized). Tokens
  also stop working when the service says so (`invalidate()`, as after an instance stop/start or
  when the TTL runs out): a client must get a new one on 401;
- `GET /latest/meta-data/spot/instance-action`: 404 until an interruption is scheduled
  (`schedule()`), then 200 and `{"action": "terminate", "time": "YYYY-MM-DDThh:mm:ssZ"}` (the
  time two minutes ahead);
- everything it was asked is kept in `requests` (method, path, status)."""

from __future__ import annotations

import datetime as _dt
import http.server
import json
import secrets
import threading
import time


class FakeImds:
    def __init__(self, host: str = "127.0.0.1"):
        self.tokens: dict[str, float] = {}
        self.action: dict | None = None
        self.scheduled_at: float | None = None
        self.requests: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):  # noqa: D401 - quiet
                pass

            def _answer(self, status: int, body: str = "") -> None:
                with fake.lock:
                    fake.requests.append((self.command, self.path, status))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):  # noqa: N802
                if self.path != "/latest/api/token":
                    return self._answer(404)
                if self.headers.get("X-Forwarded-For"):
                    return self._answer(403)
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self._answer(400)
                token = secrets.token_urlsafe(32)
                with fake.lock:
                    fake.tokens[token] = time.monotonic() + int(ttl)
                return self._answer(200, token)

            def do_GET(self):  # noqa: N802
                token = self.headers.get("X-aws-ec2-metadata-token", "")
                with fake.lock:
                    good = fake.tokens.get(token, 0) > time.monotonic()
                if not good:
                    return self._answer(401)
                if self.path == "/latest/meta-data/spot/instance-action":
                    with fake.lock:
                        action = fake.action
                    return self._answer(200, json.dumps(action)) if action else self._answer(404)
                return self._answer(404)

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def clear(self) -> None:
        """A new instance behind the same address: no tokens, no notice."""
        with self.lock:
            self.tokens.clear()
            self.action = None

    def invalidate(self) -> None:
        with self.lock:
            self.tokens.clear()

    def schedule(self, action: str = "terminate", in_s: int = 120) -> None:
        when = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=in_s)
        with self.lock:
            self.action = {"action": action, "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
            self.scheduled_at = time.time()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
