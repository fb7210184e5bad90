"""The ground floor: trajectory types, errors, plugin lookup, paths. Imports none of our folders."""
