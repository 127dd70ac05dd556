"""gunicorn settings for examples/fleet/flask_app.py (docs/fleet.md, "gunicorn with Flask and SQLAlchemy") and
examples/fleet/django_app.py (docs/dual-write-django.md).

    gunicorn -c examples/fleet/gunicorn.conf.py flask_app:app
    gunicorn -c examples/fleet/gunicorn.conf.py django_app:application

Every worker process gets its own DualWriterPool (made after the fork), with DUAL_WRITE_SIZE = threads writers.
Command-line flags override these values (``--workers 2``); the environment variables below set them for a
container image.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# the applications sit beside this file; each keeps its pool in a module-level `writers`
APP_MODULES = ("flask_app", "django_app")
pythonpath = str(Path(__file__).resolve().parent)
bind = os.environ.get("BIND", "0.0.0.0:8000")
# processes: each has its own interpreter (the GIL caps one near a few hundred dual writes/s: docs/dual-write.md)
workers = int(os.environ.get("WEB_CONCURRENCY", "4"))
# request threads per worker: each request holds one pooled writer for its transaction() block
worker_class = "gthread"
threads = int(os.environ.get("GUNICORN_THREADS", "8"))
# recycle a worker after this many requests (memory growth); its ids go back to the fleet at exit (worker_exit)
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "2000"))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", "200"))
# after SIGTERM a worker finishes its requests within graceful_timeout, then worker_exit closes the pool; the master
# SIGKILLs a worker still alive graceful_timeout after its signal: keep room for pool.close() (bounded by
# max.block.ms per unfinished writer; normally milliseconds). A worker killed anyway loses its ids after lease_s.
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
# a worker that stops notifying the master for this long is killed: also bounds post_worker_init (making the pool,
# bounded by max.block.ms) and worker_exit after a recycle
timeout = 30
# the pool must never be made in the master: a pool refuses use after a fork. flask_app makes it on first use, so
# --preload would be harmless here; leaving it off also lets a SIGHUP (a reload) load the new version's code
preload_app = False


def post_fork(server, worker):  # type: ignore[no-untyped-def]
    """In the new worker: one writer per request thread (``threads``, also when --threads overrides it), unless
    DUAL_WRITE_SIZE says otherwise."""
    os.environ.setdefault("DUAL_WRITE_SIZE", str(server.cfg.threads))


def post_worker_init(worker):  # type: ignore[no-untyped-def]
    """In the worker, before its first request: make the pool now, so its lease keeper starts settling what dead
    workers left. A failure is only logged (the first request tries again): an exception escaping a gunicorn hook
    fails the worker's boot, and gunicorn then stops altogether."""
    app_module = next((sys.modules[name] for name in APP_MODULES if name in sys.modules), None)
    if app_module is None:
        return
    try:
        app_module.writers.pool()
    except Exception as exc:
        worker.log.warning("dual-writer pool not made yet (%r); the first request tries again", exc)


def worker_exit(server, worker):  # type: ignore[no-untyped-def]
    """In the worker, after its last request (a max_requests recycle, SIGTERM from the master or Kubernetes): close
    the pool, which settles what its writers left unfinished and gives their ids back to the fleet."""
    app_module = next((sys.modules[name] for name in APP_MODULES if name in sys.modules), None)
    if app_module is not None:
        app_module.writers.close()
