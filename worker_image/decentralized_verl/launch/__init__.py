"""Executors of a plan on one machine (`dverl run`): local processes (`local`), or a Ray cluster's actors
(`ray_executor`), driven by one supervisor loop (`run`)."""
