"""Reading the cluster: figures for the metrics endpoint, relier_status and the admin."""
