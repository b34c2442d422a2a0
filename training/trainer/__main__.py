"""`python -m training.trainer [--config FILE.yaml] [--section.field VALUE ...]`: the kit's trainer."""

from training import resilience
from training.trainer.train import main

resilience.leave(main())
