"""Rules that both sides keep: modules the laptop imports and that fleet.nodeside.bundle puts
into the node programs that import them (standard library only, Python 3.8+), so that no rule
is copied between the laptop's side and the node's."""
