"""What a run reports: metrics as JSONL and to trackers (TensorBoard, W&B, MLflow), one progress line per
step, and honest intervals for accuracies. Any layer above `core/` may use it; it computes nothing of
the training itself."""
