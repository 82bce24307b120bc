"""The programs a rented node runs before and beside Ray, standard library only: the failsafe (it gives the
node back when the fleet is gone), the node setup (the software the image lacks) and the TLS front of the
Jobs API and JupyterLab. They import nothing of ours: providers.bootstrap packs each one's source into the
node's start script (tests/unit/test_onnode.py holds them to that)."""
