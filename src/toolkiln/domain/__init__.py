"""Pure types and rules of Toolkiln. Imports no framework."""
