"""Launching and watching nodes, the part every launcher shares: the Launcher contract and the
torchrun command line (`launch`), data staging and setup (`staging`), the health check's judge
(`health`), the node supervisor of local and ssh nodes (`supervisor`), metrics read from node logs
(`metrics`, `text_metrics`, `control`), lost nodes (`nodeloss`), this machine's run processes
(`procs`) and outputs brought home (`outputs`)."""
