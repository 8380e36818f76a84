"""From a finding to a fix: which findings BookKeeper's own autorecovery repairs once their ledgers are marked
under-replicated (`plan`), and the leader's hand-off that marks them (`handoff`). scrutiny never writes a
bookie's data: it writes the mark BookKeeper's Auditor would have written, and a replication worker copies."""
