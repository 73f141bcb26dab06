# A regular package (not a namespace one) so that "tests.harness" and "tests.scenarios.<module>" resolve to
# this repository's tests even when some installed distribution ships a top-level "tests" package, and so
# that the rank processes (started from the repository root) import scenarios under the same names as pytest.
