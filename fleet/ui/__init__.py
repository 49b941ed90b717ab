"""`fleet ui`: the lab's page, served from this machine (fleet.ui.server), made of the same
answers the CLI prints (fleet.ui.data) and the run's events (fleet.ui.live)."""
