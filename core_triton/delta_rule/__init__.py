"""The delta-rule family: gated delta rule (GDN, scalar gates) and its
per-key-channel variant (KDA), chunk-parallel and recurrent."""
