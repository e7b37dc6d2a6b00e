"""``serve --workers N``: a supervisor and N gateway processes on shared listeners
(``_supervisor`` has the rules; ``_worker`` is one worker; ``_merge`` merges /metrics)."""

from ._merge import COMBINE as COMBINE, PodMetrics as PodMetrics, merge_texts as merge_texts
from ._supervisor import Supervisor as Supervisor
from ._worker import EXIT_FATAL as EXIT_FATAL, WorkerPlan as WorkerPlan
