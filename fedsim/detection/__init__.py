"""Detection helpers behind small functions that raise on bad input: box fusion (:mod:`fedsim.detection.fusion`,
ensemble-boxes) and COCO mAP (:mod:`fedsim.detection.metrics`, pycocotools)."""
