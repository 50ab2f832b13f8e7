"""The adaptive tuner: config.pbtxt rewritten from measured P95, offline against a load test or online."""
