"""From the flags, task files and config to a validated plan, before anything is created: stack
config and task files (`stackconfig`, `taskfile`, `userconfig`), the job's arguments and environment
(`jobargs`, `jobenv`), what is shipped (`shipping`), `--resume` (`resume`), time bounds (`bounds`)
and placement across clouds and regions (`placement`, `shared_answers`, `egress`)."""
