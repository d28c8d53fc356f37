"""`make soak`: the whole platform at once (nginx, gateway replicas, two Tritons, Redis, Milvus, the upstream
simulators), under mixed traffic from several teams, broken on a schedule, judged against its SLOs.

Modules, one job each: `processes` (one supervised process), `platform` (start, supervise, stop the platform),
`teams` (keys and limits), `data` (what is sent), `traffic` (the open-loop load), `faults` (the schedule),
`capacity` (the step load), `rules` (the SLOs), `report` (report.md, soak.json, plots), `part` (the command line).
"""
