"""The run's state in Redis: the ledger's runs, instances and sweeps (models), their events (payloads,
events), what the nodes printed (nodelogs), what runs cost and may cost (cost, worstcase, budget), the
stages and their table (stages) and every key (keys). The queue that moves runs is broker/'s."""
