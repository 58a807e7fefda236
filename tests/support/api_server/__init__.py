"""The API server's strictness, put in front of kmock's emulator (which only stores objects): structural
schema validation with defaulting and pruning, the CRD's CEL rules, resourceVersions with 409 Conflict,
watches that expire with 410 Gone, admission (Pod Security, ResourceQuota) and RBAC from the chart.

`strict.StrictEmulator` is the emulator; the other modules are the pure rules it applies.
"""
