"""What a run shows its user: ``view`` (the episodes as one HTML page, ``agentkit view``), ``plots``
(curves from a run folder's metrics and evals, ``agentkit plot``) and ``trackers`` (metrics and
episode tables sent to W&B, MLflow, TensorBoard, ...). The training loop writes the files; these only
read them, or forward them.
"""
