"""shardnode's benchmark (``scripts/bench``, ``python -m scripts.benchmark``).

    __main__     arguments and the run: scenarios in turn, tables, JSON, plot
    settings     limits, units, system names, ``Settings``
    measure      ``ClientResult``, ``Measurement``, ``Row``, percentiles, ``RssSampler``
    clients      ``Job`` and the client processes: ``Gate``, ``run_clients``
    workloads/   each server system's client functions, run inside client processes
    peers/       the systems: ``base`` (the ``Server`` protocol, finding or installing a
                 program), ``node``, ``redis``, ``rabbitmq``; the references ``floor``, ``disk``
    bench        a run's state: the servers started, shared steps (fills, jobs, once-only
                 measurements)
    scenarios/   one module per scenario, the registry and ``run_scenario``
    targets      the issues' goals, judged on a run's rows
    report       the tables and the plot

A new scenario is a module in ``scenarios/`` plus its entry in ``SCENARIOS``; a new peer is
a module in ``peers/`` (with its client functions in ``workloads/`` when it is a server)
plus its entry in ``peers.SERVER_PEERS`` or ``peers.REFERENCES``.
"""
