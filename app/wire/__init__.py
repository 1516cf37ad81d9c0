"""The wire: what a client sends and reads. The request, response and error shapes (contract.py), a
batch's results and the jobs' reports (contract_jobs.py), a request's images read off the wire
(assets.py) and image files checked from their bytes (images.py). No I/O beyond the bytes handed in."""
