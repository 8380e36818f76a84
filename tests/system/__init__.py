"""The system as operators run it: real stores, agents, runs, the auditor, its console, its commands."""
