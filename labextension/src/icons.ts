import { LabIcon } from '@jupyterlab/ui-components';

// Distinct from the notebook's own run (▶) and interrupt (■) buttons: a bar before the triangle
// (resume) and a square inside a ring (end training).
const continueSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="5" y="5" width="3" height="14"/>
    <path d="M10 5v14l10-7z"/>
  </g>
</svg>`;

const terminateSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M12 2a10 10 0 1 0 0 20 10 10 0 0 0 0-20zm0 2a8 8 0 1 1 0 16 8 8 0 0 1 0-16z"/>
    <rect x="8" y="8" width="8" height="8"/>
  </g>
</svg>`;

export const continueIcon = new LabIcon({ name: 'nbdebug:continue', svgstr: continueSvg });
export const terminateIcon = new LabIcon({ name: 'nbdebug:terminate', svgstr: terminateSvg });
