"""Imported last in the workers' fork server, once the job's modules are: every object so far
is put out of the garbage collector's reach (`gc.freeze`). A worker's collections then leave
the pages it shares with the server unwritten, and the server ends in milliseconds: its exit's
collections walked the modules' objects (0.2 s when they were Beam's, which a job with remote
paths still loads), and the launcher waits for it."""

import gc

gc.freeze()
