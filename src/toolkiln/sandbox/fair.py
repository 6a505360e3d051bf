"""The sandbox's fair shares between workspaces: ``toolkiln.domain.fair`` (also used by the
pattern processes, ``http_request``'s slots and its name lookups)."""

from toolkiln.domain.fair import FairShare

__all__ = ["FairShare"]
