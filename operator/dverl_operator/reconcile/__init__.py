"""Pure: (the RLHFJob, its observed children, coordinator progress, the clock) -> what to do. `decide`
(decide.py) reads an `Observed` and the `Settings` and returns `Actions`; the loop's I/O side fills the one
and applies the other."""
