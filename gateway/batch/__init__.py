"""OpenAI batch jobs: files, batches, and the runner that feeds their lines to the pipeline.

``objects.py`` the stored records and their OpenAI JSON; ``validate.py`` the line checks;
``files.py`` the ``FileStore`` (bytes on disk); ``state.py`` the state interface with
``sqlite.py`` (no Redis) and ``redis.py``; ``jobs.py`` what the API calls; ``control.py`` the
pacing rule; ``runner.py`` the per-process runner; ``output.py`` the result lines.

Wiring (in ``Gateway``)::

    jobs = make_batch_jobs(policy.batch, redis_url)     # Gateway.__init__
    runner = BatchRunner(gateway, jobs, execute)       # Gateway.__init__: execute = the pipeline
    await jobs.open(); runner.start()                  # Gateway.start
    await runner.stop(); await jobs.close()            # Gateway.close, before the ledger closes
"""

from __future__ import annotations

from gateway.batch.control import PoolLoad, target_in_flight
from gateway.batch.errors import (
    BatchFileInvalid,
    BatchFileTooLarge,
    BatchNotCancellable,
    ObjectNotFound,
)
from gateway.batch.files import FileStore, LocalFileStore
from gateway.batch.jobs import BatchJobs, make_batch_jobs
from gateway.batch.objects import BatchRecord, FileRecord, LineResult, batch_object, file_object
from gateway.batch.runner import BatchRunner, Execute, LineAnswer, LineCall
from gateway.batch.state import BatchState
from gateway.batch.validate import Limits, validate_file

__all__ = [
    "BatchFileInvalid",
    "BatchFileTooLarge",
    "BatchJobs",
    "BatchNotCancellable",
    "BatchRecord",
    "BatchRunner",
    "BatchState",
    "Execute",
    "FileRecord",
    "FileStore",
    "Limits",
    "LineAnswer",
    "LineCall",
    "LineResult",
    "LocalFileStore",
    "ObjectNotFound",
    "PoolLoad",
    "batch_object",
    "file_object",
    "make_batch_jobs",
    "target_in_flight",
    "validate_file",
]
