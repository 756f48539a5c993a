"""Recipe tests run the recipes as subprocesses, like users do."""
