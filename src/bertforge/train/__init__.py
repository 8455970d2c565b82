"""The training wing: the optimisation step (:mod:`.engine`), a run's life (:mod:`.lifecycle`: its output rules,
progress, evaluation, checkpoints, resume and end), where a run starts from (:mod:`.plan`), what a run's folder
holds (:mod:`.runfolder`), and the two training commands on that lifecycle (:mod:`.pretrain`, :mod:`.finetune`)."""
