"""What the engine sees of a run: one dispatch mode for every op (:mod:`.dispatch`), the module
running each op in forward and backward (:mod:`.modules`), and the replay of repeated stock leaf
modules (:mod:`.memo`)."""
