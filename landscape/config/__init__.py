"""What a recipe says and builds: training recipes read and validated, their overrides, user imports, and the set-up (device, data, model) they build."""
