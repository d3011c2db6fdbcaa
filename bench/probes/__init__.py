"""One-off measurements behind a design choice; ``python -m bench`` runs none
of them (each module says what it measured and how to run it)."""
