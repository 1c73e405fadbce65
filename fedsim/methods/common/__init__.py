"""What several method families share: the training loop, aggregation, the evaluation summary, batch-norm helpers,
the classifier, the target's encoded features, the pooled uploads, batched local training, the stage cache."""
