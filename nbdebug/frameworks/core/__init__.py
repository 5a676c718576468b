"""The framework-neutral capture core both adapters feed (see :mod:`.capture`)."""
