"""The search space: a YAML document (errors with file:line), its knobs (values, scope, restart class,
priors) and the constraints between them. Pure data: nothing here imports a target or torch."""
