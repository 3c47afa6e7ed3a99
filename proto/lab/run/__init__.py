"""A lab run: the servers and the interleaved rollouts (``runner``), the clients that speak the wires
(``clients``), the order and seeds (``design``), other servers' endpoints (``peers``), a run's directory of
kept cells (``store``) and many agents on one engine (``fleet``)."""
