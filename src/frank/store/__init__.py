"""What frank keeps: the content-addressed store, fetching into it, git sources, file locks.

One job: get pinned bytes onto this machine and hand them out only by content. ``blobs`` is
the store (``$FRANK_CACHE``), ``fetch`` fills it (mirror folders first, then the network; every
byte verified), ``gitsource`` checks out a pinned commit on the host, ``flock`` holds file
locks, ``memo`` keeps read commands' answers, ``jsonl`` appends records atomically.

May import: the root modules and frank.model.
"""
