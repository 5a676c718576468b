"""``python -m nbdebug.run train.py args...``: run a training script attached to a notebook's listener
(see :mod:`nbdebug.remote.runner`)."""

from .remote.runner import main

if __name__ == "__main__":
    main()
