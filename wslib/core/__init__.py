"""What every chapter builds on: neurons, models, data, training, norms, interpolation, matching."""
