"""`fleet doctor` as data: which hosts meet in which round of link tests, the figures a look at
the hosts gives, the verdict over them (pure), and what the laptop keeps of them."""
