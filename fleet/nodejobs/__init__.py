"""Jobs fleet itself runs on the nodes (synced and launched like any user job)."""
