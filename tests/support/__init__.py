"""The tests' own library: fixtures' builders, tiny model files, image files, servers in threads and
the pieces more than one test module uses. A test module imports from here, never from another test
module (tests/test_layering.py checks it)."""
