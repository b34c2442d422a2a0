"""`python -m training.trainer [--config FILE.yaml] [--section.field VALUE ...]`: the kit's trainer
(train.py)."""

from training.runtime.process_exit import leave
from training.trainer.train import main

leave(main())
