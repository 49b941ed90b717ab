"""The hosts backend: a job run over SSH on the hosts of an inventory."""
